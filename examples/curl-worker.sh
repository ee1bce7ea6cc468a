#!/usr/bin/env bash
# A leaseq worker in shell, with curl and jq (Linux: /proc/uptime, setsid).
#
#   LEASEQ_URL=http://127.0.0.1:8000 examples/curl-worker.sh QUEUE COMMAND [ARG...]
#
# For each message, COMMAND runs with the body on its stdin and LEASEQ_MESSAGE_ID,
# LEASEQ_RECEIPT_HANDLE, LEASEQ_FENCING_TOKEN, LEASEQ_RECEIVE_COUNT and
# LEASEQ_CHECKPOINT (JSON) in its environment. Meanwhile a background loop
# extends the lease by its full length every third of it. If an extension
# answers 409 (the message is someone else's now), or the lease runs out because
# extensions kept failing, COMMAND is killed (SIGTERM) and the message is left
# alone. When COMMAND exits 0 the message is deleted (acknowledged); otherwise it
# is released for another attempt (POST .../release): after the delay of the
# queue's retry ladder (its retry_backoff; at once without one), or after
# LEASEQ_RETRY_DELAY seconds when that is set.
#
# Settings (environment): LEASEQ_URL (http://127.0.0.1:8000), LEASEQ_LEASE
# (seconds, 30), LEASEQ_WAIT (long-poll seconds, 20), LEASEQ_RETRY_DELAY (seconds,
# unset: the queue's ladder decides), LEASEQ_ONCE (set: handle one message, then
# exit), LEASEQ_API_KEY (<key id>.<secret> when the service requires keys; passed
# to curl from a private file, never on its command line). SIGTERM/SIGINT stop it
# after the current message.
#
# The deadline is kept on the monotonic clock (/proc/uptime) from the moment
# the receive request is sent, never from the server's lease_expires_at.

set -uo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 QUEUE COMMAND [ARG...]" >&2
  exit 2
fi
QUEUE=$1
shift
URL=${LEASEQ_URL:-http://127.0.0.1:8000}
LEASE=${LEASEQ_LEASE:-30}
WAIT=${LEASEQ_WAIT:-20}
ONCE=${LEASEQ_ONCE:-}
RETRY_DELAY=${LEASEQ_RETRY_DELAY:-}
PERIOD_MS=$((LEASE * 1000 / 3))
BASE="$URL/v1/queues/$QUEUE"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# Every curl reads its extra headers from here (-H @file): the key stays out of `ps`.
HEADERS="$WORK/headers"
: > "$HEADERS"
if [ -n "${LEASEQ_API_KEY:-}" ]; then
  printf 'Authorization: Bearer %s\n' "$LEASEQ_API_KEY" > "$HEADERS"
fi
STOPPING=
trap 'STOPPING=1' TERM INT

log() { echo "$(date -u +%FT%TZ) curl-worker: $*" >&2; }

now_ms() { # monotonic milliseconds since boot
  local up _
  read -r up _ </proc/uptime
  echo $((10#${up/./} * 10))
}

seconds() { printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000)); }

stop_handler() { # the command and everything it started (its own process group)
  kill -TERM -- "-$1" 2>/dev/null || kill -TERM "$1" 2>/dev/null
}

# heartbeat HANDLE PID DEADLINE_MS STATE_FILE: runs in the background.
heartbeat() {
  local handle=$1 pid=$2 deadline=$3 state=$4 next sent code
  next=$(($(now_ms) + PERIOD_MS))
  while kill -0 "$pid" 2>/dev/null; do
    sent=$(now_ms)
    if ((sent >= deadline)); then # no beat once the lease is past
      echo lease_expired >"$state"
      stop_handler "$pid"
      return
    fi
    if ((sent < next)); then
      sleep "$(seconds $(((next < deadline ? next : deadline) - sent)))"
      continue
    fi
    code=$(curl -s -H @"$HEADERS" -o /dev/null -w '%{http_code}' --max-time "$(seconds $((deadline - sent)))" \
      -X PATCH "$BASE/messages/$handle/visibility" \
      -H 'content-type: application/json' -d "{\"timeout\": $LEASE}") || code=000
    case $code in
      200)
        deadline=$((sent + LEASE * 1000))
        next=$((sent + PERIOD_MS))
        ;;
      409 | 404 | 400)
        echo lease_lost >"$state"
        stop_handler "$pid"
        return
        ;;
      *)
        log "heartbeat failed (HTTP $code); retrying"
        next=$((sent + PERIOD_MS / 2))
        ;;
    esac
  done
}

log "worker on $URL queue '$QUEUE': lease ${LEASE}s"
while [ -z "$STOPPING" ]; do
  sent=$(now_ms) # the lease starts after this, never before
  curl -sS -H @"$HEADERS" --max-time $((WAIT + 10)) -o "$WORK/received.json" -w '%{http_code}' \
    "$BASE/receive?max=1&wait=$WAIT&visibility_timeout=$LEASE" >"$WORK/status" 2>"$WORK/error" &
  poll=$!
  if ! wait "$poll"; then
    kill "$poll" 2>/dev/null
    [ -n "$STOPPING" ] && break
    log "receive failed: $(cat "$WORK/error")"
    sleep 1
    continue
  fi
  status=$(cat "$WORK/status")
  if [ "$status" != 200 ]; then
    log "receive refused (HTTP $status): $(cat "$WORK/received.json")"
    [ "$status" -ge 500 ] || exit 1
    sleep 1
    continue
  fi
  [ "$(jq '.messages | length' "$WORK/received.json")" = 0 ] && continue

  jq -r '.messages[0].body' "$WORK/received.json" >"$WORK/body"
  id=$(jq -r '.messages[0].message_id' "$WORK/received.json")
  handle=$(jq -r '.messages[0].receipt_handle' "$WORK/received.json")
  fencing=$(jq -r '.messages[0].fencing_token' "$WORK/received.json")
  lease=$(jq -r '.messages[0].lease_seconds' "$WORK/received.json")
  : >"$WORK/state"

  LEASEQ_MESSAGE_ID=$id LEASEQ_RECEIPT_HANDLE=$handle LEASEQ_FENCING_TOKEN=$fencing \
    LEASEQ_RECEIVE_COUNT=$(jq -r '.messages[0].receive_count' "$WORK/received.json") \
    LEASEQ_CHECKPOINT=$(jq -c '.messages[0].checkpoint' "$WORK/received.json") \
    setsid "$@" <"$WORK/body" & # a process group of its own, so that it can be stopped whole
  handler=$!
  heartbeat "$handle" "$handler" $((sent + lease * 1000)) "$WORK/state" &
  beat=$!
  while :; do # `wait` returns early when a signal arrives: wait again
    wait "$handler"
    result=$?
    kill -0 "$handler" 2>/dev/null || break
  done
  kill "$beat" 2>/dev/null
  wait "$beat" 2>/dev/null

  name="message $id (fencing $fencing)"
  if [ -s "$WORK/state" ]; then
    log "$name abandoned: the watchdog cancelled it ($(cat "$WORK/state"))"
  elif [ "$result" = 0 ]; then
    code=$(curl -s -H @"$HEADERS" -o /dev/null -w '%{http_code}' --max-time 30 -X DELETE "$BASE/messages/$handle")
    case $code in
      204) log "$name acknowledged" ;;
      409) log "$name: acknowledgement rejected (lease lost)" ;;
      *) log "$name: acknowledgement failed (HTTP $code); it will be redelivered" ;;
    esac
  else
    release='{}' # the queue's retry ladder decides
    [ -n "$RETRY_DELAY" ] && release="{\"delay\": $RETRY_DELAY}"
    code=$(curl -s -H @"$HEADERS" -o "$WORK/released.json" -w '%{http_code}' --max-time 30 \
      -X POST "$BASE/messages/$handle/release" \
      -H 'content-type: application/json' -d "$release") || code=000
    if [ "$code" = 200 ]; then
      log "$name failed (exit $result); released, visible again in $(jq -r \
        '.delay_seconds * 100 | round / 100' "$WORK/released.json")s"
    else
      log "$name failed (exit $result); release failed (HTTP $code); it returns when its lease ends"
    fi
  fi
  [ -n "$ONCE" ] && break
done
log "worker stopped"
