// The leaseq dashboard: the queue list, a queue, a dead-letter queue. Every
// reading and every change goes through the REST API (or /ui/api for the two
// readings it has no route for) with the signed-in key: signing in starts a
// session the browser keeps in an HttpOnly cookie (never the key itself), and
// this script never sees it. Signing out ends it on the server. Text from queues
// (names, bodies) only ever goes into the page as text nodes. A module: strict,
// run once the page is parsed.

import {
  age, api, every, flash, h, present, q, sparkline, when,
} from './dashboard-kit.js';

(() => {
  const REFRESH_MS = 2000;
  const app = document.getElementById('app');
  let session = null;

  // What the key may do, as the server's scopes say (app/auth/scopes.py); the
  // server decides, this only greys out what it would refuse.
  function can(action, queue) {
    return session.scopes.some((scope) => {
      const [act, pattern] = scope.split(':');
      if (act !== action && act !== 'admin') return false;
      const regex = new RegExp(
        '^' + pattern.split('*').map((p) => p.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')).join('.*') + '$',
      );
      return regex.test(queue);
    });
  }

  // -- signing in -------------------------------------------------------------

  function renderWho() {
    const nav = document.getElementById('who');
    nav.replaceChildren();
    if (!session.keys_required) {
      nav.append(h('span', { text: 'open service: no key needed' }));
      return;
    }
    nav.append(
      h('span', { id: 'signed-in' }, `${session.name} (${session.key_id}): ${session.scopes.join(' ')}`),
      h('button', {
        class: 'secondary', id: 'sign-out',
        onclick: async () => {
          try {
            await api('DELETE', '/ui/session');
            location.reload();
          } catch (failure) {
            flash(`Not signed out: ${failure.message}`, true);
          }
        },
      }, 'Sign out'),
    );
  }

  function loginPage(reason) {
    const error = h('p', { class: 'error', id: 'login-error' }, reason || '');
    const input = h('input', { id: 'key', type: 'password', autocomplete: 'off', required: true,
      placeholder: 'LQ….secret' });
    const form = h('form', {
      class: 'login',
      onsubmit: async (event) => {
        event.preventDefault();
        try {
          await api('POST', '/ui/session', { key: input.value });
          location.reload();
        } catch (failure) {
          error.textContent = failure.message;
        }
      },
    },
    h('label', {}, 'API key', input),
    h('div', { class: 'row' }, h('button', { type: 'submit', id: 'sign-in' }, 'Sign in')),
    error);
    app.replaceChildren(
      h('h1', {}, 'Sign in'),
      h('p', { class: 'muted' },
        'This service needs an API key. It is checked, not kept: signing in starts a session in a cookie no script can read, until you sign out or close the browser (12 hours at most by default).'),
      form,
    );
  }

  // -- the queue list ---------------------------------------------------------

  function listPage() {
    const body = h('tbody');
    const note = h('p', { class: 'muted' });
    app.replaceChildren(
      h('h1', {}, 'Queues'),
      h('table', { id: 'queues' },
        h('thead', {}, h('tr', {},
          h('th', {}, 'Queue'), h('th', { class: 'num' }, 'Visible'),
          h('th', { class: 'num' }, 'In flight'), h('th', { class: 'num' }, 'Delayed'),
          h('th', { class: 'num' }, 'Oldest visible'), h('th', {}, 'Dead-letter queue'),
          h('th', {}, 'Sent / acknowledged, last 5 min'))),
        body),
      note,
    );
    every(REFRESH_MS, async () => {
      const overview = await api('GET', '/ui/api/overview');
      body.replaceChildren(...overview.queues.map((queue) => {
        const isDeadLetter = Object.keys(queue.dead_letter_sources).length > 0
          || queue.unreadable_sources_messages > 0;
        return h('tr', { 'data-queue': queue.name },
          h('td', {},
            h('a', { href: `/ui/queues/${q(queue.name)}` }, queue.name),
            queue.fifo ? h('span', { class: 'badge' }, 'FIFO') : null,
            isDeadLetter
              ? h('a', { class: 'badge', href: `/ui/dead-letter/${q(queue.name)}` }, 'dead-letter')
              : null),
          h('td', { class: 'num', 'data-field': 'visible' }, queue.visible),
          h('td', { class: 'num', 'data-field': 'in_flight' }, queue.in_flight),
          h('td', { class: 'num', 'data-field': 'delayed' }, queue.delayed),
          h('td', { class: 'num', 'data-field': 'oldest' }, age(queue.oldest_visible_age_seconds)),
          h('td', {}, queue.dead_letter_queue
            ? h('a', { href: `/ui/dead-letter/${q(queue.dead_letter_queue)}` }, queue.dead_letter_queue)
            : queue.dead_letter_queue_unreadable ? 'a queue this key may not read' : '–'),
          h('td', { 'data-field': 'throughput' },
            sparkline(queue.sent_per_second, queue.deleted_per_second,
              overview.sparkline_interval_seconds, overview.sparkline_window_seconds)));
      }));
      note.textContent = overview.queues.length === 0 ? 'No queues yet.'
        : overview.more ? 'The first 1000 queues by name.' : '';
    });
  }

  // -- a queue ----------------------------------------------------------------

  const EDITABLE = [
    ['visibility_timeout', 'Visibility timeout (s)'],
    ['message_retention', 'Retention (s)'],
    ['delay', 'Delay (s)'],
    ['receive_wait', 'Receive wait (s)'],
    ['max_message_bytes', 'Largest message (bytes)'],
    ['dead_letter_queue', 'Dead-letter queue'],
    ['max_receive_count', 'Receives before dead-lettering'],
  ];

  function stat(label, field) {
    return h('div', {}, h('dt', {}, label), h('dd', { 'data-field': field }, '…'));
  }

  function setField(root, field, value) {
    const el = root.querySelector(`[data-field="${field}"]`);
    if (el) el.textContent = value;
  }

  function attributesForm(name, attributes, onSaved) {
    const inputs = {};
    const admin = can('admin', name);
    const form = h('form', {
      class: 'grid', id: 'attributes',
      onsubmit: async (event) => {
        event.preventDefault();
        const changes = {};
        for (const [field] of EDITABLE) {
          const text = inputs[field].value.trim();
          const before = attributes[field] === null ? '' : String(attributes[field]);
          if (text === before) continue;
          changes[field] = field === 'dead_letter_queue' ? text : (text === '' ? null : Number(text));
        }
        if ('max_receive_count' in changes && !('dead_letter_queue' in changes)) {
          changes.dead_letter_queue = inputs.dead_letter_queue.value.trim();
        }
        if (Object.keys(changes).length === 0) { flash('Nothing changed.'); return; }
        try {
          const saved = await api('PATCH', `/v1/queues/${q(name)}`, changes);
          Object.assign(attributes, saved.attributes);
          flash(`Saved: ${Object.keys(changes).join(', ')}.`);
          onSaved(saved.attributes);
        } catch (error) { flash(error.message, true); }
      },
    });
    for (const [field, label] of EDITABLE) {
      const value = attributes[field] === null ? '' : attributes[field];
      inputs[field] = h('input', { name: field, value, disabled: !admin,
        inputmode: field === 'dead_letter_queue' ? 'text' : 'numeric' });
      form.append(h('label', {}, label, inputs[field]));
    }
    form.append(h('div', { class: 'row' },
      h('button', { type: 'submit', id: 'save-attributes', disabled: !admin }, 'Save'),
      admin ? null : h('span', { class: 'muted' }, 'Changing a queue needs admin on it.')));
    return form;
  }

  function adviceView(advice) {
    if (!advice) return h('p', { class: 'muted', id: 'advice' }, 'No receives seen yet by this process.');
    const rows = [
      ['Acknowledgements timed (10 min)', advice.samples],
      ['p99.9 lease held', advice.held_p999_seconds === null ? 'needs 100' : `${advice.held_p999_seconds} s`],
      ['Advised visibility timeout', advice.visibility_timeout === null ? '–' : `${advice.visibility_timeout} s`],
      ['Heartbeat every', advice.heartbeat_seconds === null ? '–' : `${advice.heartbeat_seconds} s`],
      ['Lease granted last', advice.lease_seconds === null ? '–' : `${advice.lease_seconds} s`],
      ['Heartbeats', advice.heartbeats],
      ['Redelivered after expiry', advice.redelivered_after_expiry],
    ];
    return h('div', { id: 'advice' },
      h('table', {}, h('tbody', {}, rows.map(([k, v]) => h('tr', {}, h('th', {}, k), h('td', {}, v))))),
      advice.warnings.map((w) => h('p', { class: 'warning', 'data-warning': w },
        w === 'lease_below_p999'
          ? 'The lease is shorter than the p99.9 handling time and nothing heartbeats: raise the visibility timeout or heartbeat.'
          : 'Redeliveries after expiry are rising: work is outliving its lease.')));
  }

  function sendForm(name, fifo) {
    const body = h('textarea', { name: 'body', id: 'test-body' }, 'hello from the dashboard');
    // A FIFO queue's message needs a group; a standard queue's may name its tenant.
    const group = h('input', { name: 'group', id: 'test-group', value: fifo ? 'dashboard' : '' });
    const allowed = can('send', name);
    return h('form', {
      id: 'send',
      onsubmit: async (event) => {
        event.preventDefault();
        const message = { body: body.value };
        if (fifo || group.value) message.group = group.value;
        if (fifo) message.deduplication_id = `dashboard-${Date.now()}`;
        try {
          const sent = await api('POST', `/v1/queues/${q(name)}/messages`, message);
          flash(`Sent message ${sent.message_id}.`);
        } catch (error) { flash(error.message, true); }
      },
    },
    h('label', {}, 'Body', body),
    h('label', {}, fifo ? 'Message group' : 'Tenant (group, optional)', group),
    h('div', { class: 'row' }, h('button', { type: 'submit', id: 'send-test', disabled: !allowed }, 'Send a test message')));
  }

  function purgeControl(name, currentCount) {
    const dialog = h('dialog', { id: 'purge-dialog' });
    const question = h('p', { id: 'purge-question' });
    dialog.append(
      h('h2', {}, 'Purge this queue?'),
      question,
      h('div', { class: 'row' },
        h('button', { class: 'secondary', id: 'purge-cancel', onclick: () => dialog.close() }, 'Cancel'),
        h('button', {
          class: 'danger', id: 'purge-confirm',
          onclick: async () => {
            dialog.close();
            try {
              const done = await api('POST', `/v1/queues/${q(name)}/purge`);
              flash(`Purged ${done.purged} messages.`);
            } catch (error) { flash(error.message, true); }
          },
        }, 'Purge')));
    const button = h('button', {
      class: 'danger', id: 'purge', disabled: !can('admin', name),
      onclick: async () => {
        // Counted now, not at the last refresh: the question names what will go.
        question.textContent = `Delete all ${await currentCount()} messages of ${name}, in flight or not? This cannot be undone.`;
        dialog.showModal();
      },
    }, 'Purge…');
    return [button, dialog];
  }

  function peekView(name) {
    const states = [['', 'All'], ['visible', 'Visible'], ['in_flight', 'In flight'], ['delayed', 'Delayed']];
    let state = '';
    const body = h('tbody');
    const buttons = states.map(([value, label]) => h('button', {
      type: 'button', 'data-state': value || 'all', 'aria-pressed': value === state ? 'true' : 'false',
      onclick: (event) => {
        state = value;
        for (const b of buttons) b.setAttribute('aria-pressed', b === event.currentTarget ? 'true' : 'false');
        refresh();
      },
    }, label));
    let fetchedAt = performance.now();
    const refresh = async () => {
      const params = new URLSearchParams({ limit: '50', body_chars: '200' });
      if (state) params.set('state', state);
      const page = await api('GET', `/v1/queues/${q(name)}/messages?${params}`);
      fetchedAt = performance.now();
      body.replaceChildren(...page.messages.map((m) => h('tr', { 'data-message': m.message_id, 'data-state': m.state },
        h('td', {}, m.message_id), h('td', {}, m.state.replace('_', ' ')),
        h('td', { class: 'body' }, m.body + (m.truncated ? '…' : '')),
        h('td', { 'data-field': 'group' }, m.group === null ? '–' : m.group),
        h('td', { class: 'num', 'data-field': 'receive_count' }, m.receive_count),
        h('td', { class: 'num', 'data-field': 'fencing_token' }, m.fencing_token === null ? '–' : m.fencing_token),
        h('td', { class: 'num countdown', 'data-field': 'lease_left',
          'data-remaining': m.lease_remaining_seconds === null ? '' : m.lease_remaining_seconds }, '–'),
        h('td', {}, when(m.sent_at)))));
      tickCountdowns();
    };
    // Counted down here between readings, from what the database said was left.
    const tickCountdowns = () => {
      const passed = (performance.now() - fetchedAt) / 1000;
      for (const cell of body.querySelectorAll('.countdown')) {
        if (cell.dataset.remaining === '') continue;
        cell.textContent = `${Math.max(0, Number(cell.dataset.remaining) - passed).toFixed(1)} s`;
      }
    };
    setInterval(tickCountdowns, 200);
    every(REFRESH_MS, refresh);
    return h('div', { id: 'peek' },
      h('div', { class: 'row tabs' }, buttons),
      h('table', {}, h('thead', {}, h('tr', {},
        h('th', {}, 'Message'), h('th', {}, 'State'), h('th', {}, 'Body'), h('th', {}, 'Group'),
        h('th', { class: 'num' }, 'Receives'), h('th', { class: 'num' }, 'Fencing token'),
        h('th', { class: 'num' }, 'Lease left'), h('th', {}, 'Sent'))), body));
  }

  // A fair queue's tenants: who is noisy, and how the quiet ones' messages fare.
  function tenantsView(t) {
    const row = (label, field, value) => h('div', {}, h('dt', {}, label), h('dd', { 'data-field': field }, value));
    return h('section', {},
      h('h2', {}, 'Tenants'),
      h('dl', { class: 'stats' },
        row('Noisy tenants', 'noisy_tenants', t.noisy_tenants),
        row('Quiet visible', 'quiet_visible', t.quiet_visible),
        row('Quiet in flight', 'quiet_in_flight', t.quiet_in_flight),
        row('Quiet oldest', 'quiet_oldest', age(t.quiet_oldest_age_seconds))),
      h('table', { id: 'top-tenants' }, h('thead', {}, h('tr', {},
        h('th', {}, 'Tenant'), h('th', { class: 'num' }, 'Visible'),
        h('th', { class: 'num' }, 'In flight'), h('th', {}, 'State'))),
      h('tbody', {}, ...t.top.map((x) => h('tr', { 'data-tenant': x.tenant },
        h('td', {}, x.tenant), h('td', { class: 'num' }, x.visible),
        h('td', { class: 'num' }, x.in_flight), h('td', {}, x.noisy ? 'noisy' : 'quiet'))))));
  }

  async function queuePage(name) {
    const queue = await api('GET', `/v1/queues/${q(name)}`);
    const sources = (await api('GET', `/v1/queues/${q(name)}/dead-letter-sources`)).queues;
    const attributes = queue.attributes;
    const stats = h('dl', { class: 'stats', id: 'stats' },
      stat('Visible', 'visible'), stat('In flight', 'in_flight'), stat('Delayed', 'delayed'),
      stat('Oldest visible', 'oldest'));
    const advice = h('div', {}, adviceView(queue.lease_advice));
    const tenants = h('div', { id: 'tenants' });
    const related = h('p', { class: 'muted', id: 'related' });
    const showRelated = (attrs) => {
      related.replaceChildren(...present(
        attrs.dead_letter_queue
          ? h('span', {}, 'Dead-letter queue: ',
            h('a', { href: `/ui/queues/${q(attrs.dead_letter_queue)}` }, attrs.dead_letter_queue), '. ')
          : null,
        sources.length
          ? h('span', {}, `Dead-letter queue of ${sources.join(', ')}: `,
            h('a', { href: `/ui/dead-letter/${q(name)}`, id: 'dead-letter-page' }, 'sources and redrive'), '.')
          : null));
    };
    showRelated(attributes);
    const [purge, dialog] = purgeControl(name, async () => {
      const current = await api('GET', `/v1/queues/${q(name)}`);
      show(current);
      const s = current.stats;
      return s.visible + s.in_flight + s.delayed;
    });
    app.replaceChildren(
      h('p', {}, h('a', { href: '/ui' }, '← Queues')),
      h('h1', {}, name, attributes.fifo ? h('span', { class: 'badge' }, 'FIFO') : null,
        attributes.fair ? h('span', { class: 'badge' }, 'Fair') : null),
      related, stats, tenants,
      h('h2', {}, 'Lease advice'), h('section', { class: 'panel' }, advice),
      h('h2', {}, 'Attributes'), h('section', { class: 'panel' }, attributesForm(name, attributes, showRelated)),
      h('h2', {}, 'Send a test message'), h('section', { class: 'panel' }, sendForm(name, attributes.fifo)),
      h('h2', {}, 'Messages'), peekView(name),
      h('h2', {}, 'Danger'), h('div', { class: 'row' }, purge), dialog,
    );
    function show(current) {
      const s = current.stats;
      setField(stats, 'visible', s.visible);
      setField(stats, 'in_flight', s.in_flight);
      setField(stats, 'delayed', s.delayed);
      setField(stats, 'oldest', age(s.oldest_age_seconds));
      tenants.replaceChildren(...present(s.tenants ? tenantsView(s.tenants) : null));
      advice.replaceChildren(adviceView(current.lease_advice));
    }
    show(queue);
    setInterval(async () => {
      try { show(await api('GET', `/v1/queues/${q(name)}`)); } catch (error) { flash(error.message, true); }
    }, REFRESH_MS);
  }

  // -- a dead-letter queue ----------------------------------------------------

  async function deadLetterPage(name) {
    await api('GET', `/v1/queues/${q(name)}`); // a queue that is not there: the page says so
    const sources = (await api('GET', `/v1/queues/${q(name)}/dead-letter-sources`)).queues;
    const stats = h('dl', { class: 'stats', id: 'stats' },
      stat('Messages', 'messages'), stat('Visible', 'visible'), stat('In flight', 'in_flight'));
    const sourceList = h('ul', { id: 'sources' });
    const bar = h('progress', { id: 'redrive-progress', max: '1', value: '0' });
    const progressText = h('span', { id: 'redrive-status', class: 'muted' }, 'No redrive yet.');
    const rate = h('input', { id: 'redrive-rate', name: 'max_per_second', inputmode: 'numeric',
      placeholder: 'unlimited' });
    let following = null;
    const showTask = (task) => {
      const fraction = task.to_move_at_start > 0 ? Math.min(1, task.moved / task.to_move_at_start)
        : (task.status === 'completed' ? 1 : 0);
      bar.value = fraction;
      bar.dataset.percent = String(Math.round(fraction * 100));
      progressText.textContent = `${task.status}: moved ${task.moved} of ${task.to_move_at_start}` +
        ` (${Math.round(fraction * 100)}%)${task.failure ? ` – ${task.failure}` : ''}`;
      progressText.dataset.status = task.status;
    };
    const follow = (task) => {
      showTask(task);
      if (following) clearInterval(following);
      if (task.status !== 'running') return;
      following = setInterval(async () => {
        try {
          const now = await api('GET', `/v1/redrive-tasks/${encodeURIComponent(task.task_id)}`);
          showTask(now);
          if (now.status !== 'running') { clearInterval(following); following = null; }
        } catch (error) { flash(error.message, true); }
      }, 500);
    };
    const start = h('button', {
      id: 'redrive', disabled: !can('admin', name),
      onclick: async () => {
        const body = {};
        if (rate.value.trim()) body.max_per_second = Number(rate.value.trim());
        try { follow(await api('POST', `/v1/queues/${q(name)}/redrive`, body)); } catch (error) { flash(error.message, true); }
      },
    }, 'Redrive to the sources');
    app.replaceChildren(
      h('p', {}, h('a', { href: '/ui' }, '← Queues'), ' · ', h('a', { href: `/ui/queues/${q(name)}` }, `Queue ${name}`)),
      h('h1', {}, `Dead-letter queue ${name}`),
      stats,
      h('h2', {}, 'Sources'),
      h('p', { class: 'muted' }, 'Queues whose redrive policy names this one, and how many of the messages here came from each.'),
      sourceList,
      h('h2', {}, 'Redrive'),
      h('section', { class: 'panel' },
        h('p', { class: 'muted' }, 'Moves every message back to the queue it came from, with its receive count reset.'),
        h('div', { class: 'row' }, h('label', {}, 'At most per second', rate), start),
        h('div', { class: 'row' }, bar, progressText)),
    );
    const tasks = (await api('GET', `/v1/queues/${q(name)}/redrive`)).tasks;
    if (tasks.length) follow(tasks[0]);
    const refresh = async () => {
      const [current, overview] = await Promise.all([
        api('GET', `/v1/queues/${q(name)}`), api('GET', `/ui/api/overview?prefix=${q(name)}`),
      ]);
      const s = current.stats;
      setField(stats, 'messages', s.visible + s.in_flight + s.delayed);
      setField(stats, 'visible', s.visible);
      setField(stats, 'in_flight', s.in_flight);
      const mine = overview.queues.find((x) => x.name === name);
      const counts = mine ? mine.dead_letter_sources : {};
      const names = [...new Set([...sources, ...Object.keys(counts)])].sort();
      const unreadable = mine ? mine.unreadable_sources_messages : 0;
      sourceList.replaceChildren(...names.map((source) => h('li', { 'data-source': source },
        h('a', { href: `/ui/queues/${q(source)}` }, source), `: ${counts[source] || 0} messages`)),
        ...(unreadable ? [h('li', {}, `Queues this key may not read: ${unreadable} messages`)] : []));
    };
    every(REFRESH_MS, refresh);
  }

  // -- routes -----------------------------------------------------------------

  async function boot() {
    try {
      session = await api('GET', '/ui/api/session');
    } catch (error) {
      if (error.status === 401) { loginPage(error.message); return; }
      app.replaceChildren(h('p', { class: 'error' }, error.message));
      return;
    }
    renderWho();
    const path = location.pathname;
    const queueMatch = path.match(/^\/ui\/queues\/([^/]+)$/);
    const deadMatch = path.match(/^\/ui\/dead-letter\/([^/]+)$/);
    try {
      if (queueMatch) await queuePage(decodeURIComponent(queueMatch[1]));
      else if (deadMatch) await deadLetterPage(decodeURIComponent(deadMatch[1]));
      else listPage();
    } catch (error) {
      app.replaceChildren(h('p', {}, h('a', { href: '/ui' }, '← Queues')),
        h('p', { class: 'error', id: 'page-error' }, error.message));
    }
  }

  boot();
})();
