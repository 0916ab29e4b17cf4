#!/usr/bin/env bash
# Smoke test of the CPU image on a machine with a Docker daemon: build it, run the embedded default, ask
# /health, /ready, /v1/models, a streaming chat with an adapter, SageMaker's /ping and /invocations, wait for the
# image's HEALTHCHECK to report healthy, then send SIGTERM and check that the container drains and exits 0 in
# time. Prints the image size and the time from `docker run` to ready.
#
#   scripts/smoke_image.sh                  # build loraplex:cpu from docker/Dockerfile.cpu, then test it
#   BUILD=0 scripts/smoke_image.sh          # test an image built before
#
# Settings (environment):
#   IMAGE             image tag (loraplex:cpu)
#   PORT              host port (8000)
#   NETWORK           bridge: `docker run -p 127.0.0.1:PORT:8000`, the image's defaults (0.0.0.0:8000 inside);
#                     host: the host's network, bound to 127.0.0.1:PORT via LORAPLEX_BIND_HOST and
#                     SAGEMAKER_BIND_TO_PORT, for machines whose traffic must stay on loopback (bridge)
#   PYTHON_IMAGE      base image for both stages (the Dockerfile's default: python:3.11-slim-bookworm)
#   TORCH_INDEX_URL   where pip finds torch 2.13.0+cpu (the Dockerfile's default: the PyTorch CPU index)
#   LORAPLEX_WHEELS   a folder of wheels copied into docker/wheels/ for the build (e.g. a local torch wheel)
#   BUILD_NETWORK     `docker build --network` (default: the daemon's)
#   STOP_TIMEOUT_S    seconds the container may take to exit after SIGTERM (45)
set -euo pipefail

cd "$(dirname "$0")/.."
DOCKER=${DOCKER:-docker}
IMAGE=${IMAGE:-loraplex:cpu}
PORT=${PORT:-8000}
NETWORK=${NETWORK:-bridge}
STOP_TIMEOUT_S=${STOP_TIMEOUT_S:-45}
NAME=loraplex-smoke-$$
URL=http://127.0.0.1:${PORT}

say() { printf '[smoke] %s\n' "$*" >&2; }
fail() { say "FAIL: $*"; "$DOCKER" logs --tail 50 "$NAME" >&2 2>&1 || true; exit 1; }
cleanup() { "$DOCKER" rm -f "$NAME" >/dev/null 2>&1 || true; }
trap cleanup EXIT

if [ "${BUILD:-1}" = 1 ]; then
    build_args=(--build-arg "REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)"
                --build-arg "CREATED=$(date -u +%Y-%m-%dT%H:%M:%SZ)")
    [ -n "${PYTHON_IMAGE:-}" ] && build_args+=(--build-arg "PYTHON_IMAGE=$PYTHON_IMAGE")
    [ -n "${TORCH_INDEX_URL:-}" ] && build_args+=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL")
    [ -n "${BUILD_NETWORK:-}" ] && build_args+=(--network "$BUILD_NETWORK")
    if [ -n "${LORAPLEX_WHEELS:-}" ]; then
        cp "$LORAPLEX_WHEELS"/*.whl docker/wheels/
    fi
    say "building $IMAGE"
    started=$(date +%s)
    "$DOCKER" build -f docker/Dockerfile.cpu -t "$IMAGE" "${build_args[@]}" .
    say "built in $(( $(date +%s) - started )) s"
fi
size=$("$DOCKER" image inspect --format '{{.Size}}' "$IMAGE")
say "image $IMAGE: $(( size / 1000000 )) MB"

run_args=(--detach --name "$NAME" --read-only --tmpfs /tmp --shm-size 1g --stop-timeout "$STOP_TIMEOUT_S")
if [ "$NETWORK" = host ]; then
    run_args+=(--network host -e LORAPLEX_BIND_HOST=127.0.0.1 -e "SAGEMAKER_BIND_TO_PORT=$PORT")
else
    run_args+=(-p "127.0.0.1:${PORT}:8000")
fi
started=$(date +%s)
"$DOCKER" run "${run_args[@]}" "$IMAGE" >/dev/null
until curl -fsS "$URL/ready" >/dev/null 2>&1; do
    [ "$("$DOCKER" inspect --format '{{.State.Running}}' "$NAME")" = true ] || fail "the container exited"
    [ $(( $(date +%s) - started )) -lt 300 ] || fail "not ready after 300 s"
    sleep 1
done
say "ready $(( $(date +%s) - started )) s after docker run"

curl -fsS "$URL/health" | grep -q '"ok"' || fail "/health"
curl -fsS "$URL/ping" | grep -q '"ready"' || fail "/ping"
models=$(curl -fsS "$URL/v1/models")
for model in smollm2-135m-instruct pirate uppercase json-answer tool-caller; do
    grep -q "\"$model" <<<"$models" || fail "/v1/models lacks $model: $models"
done
say "/v1/models: base model and the four demo adapters"

stream=$(curl -fsSN "$URL/v1/chat/completions" -H 'content-type: application/json' \
    -d '{"model": "pirate", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": true}')
grep -q '"chat.completion.chunk"' <<<"$stream" || fail "no chunk in the stream: $stream"
grep -q '"model":"pirate@1"' <<<"$stream" || fail "the stream was not served by pirate@1: $stream"
[ "$(grep '^data: ' <<<"$stream" | tail -n 1)" = "data: [DONE]" ] || fail "the stream did not end with [DONE]"
say "streaming chat with pirate: $(grep -c '^data: {' <<<"$stream") chunks, then [DONE]"

invocation=$(curl -fsS "$URL/invocations" -H 'content-type: application/json' \
    -H 'X-Amzn-SageMaker-Custom-Attributes: model=json-answer' \
    -d '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}')
grep -q '"model":"json-answer@1"' <<<"$invocation" || fail "/invocations: $invocation"
say "/invocations with model=json-answer in the custom attributes"

until [ "$("$DOCKER" inspect --format '{{.State.Health.Status}}' "$NAME")" = healthy ]; do
    [ $(( $(date +%s) - started )) -lt 360 ] || fail "HEALTHCHECK not healthy"
    sleep 2
done
say "HEALTHCHECK: healthy"

stopping=$(date +%s)
"$DOCKER" kill --signal SIGTERM "$NAME" >/dev/null
code=$(timeout "$STOP_TIMEOUT_S" "$DOCKER" wait "$NAME") || fail "still running ${STOP_TIMEOUT_S} s after SIGTERM"
[ "$code" = 0 ] || fail "exit code $code after SIGTERM"
say "SIGTERM: exited 0 after $(( $(date +%s) - stopping )) s"
"$DOCKER" logs "$NAME" 2>&1 | grep -q "drain complete" || fail "no completed drain in the log"
say "PASS"
