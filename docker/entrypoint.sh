#!/bin/sh
# The image's entrypoint (behind tini). `docker run IMAGE` and SageMaker's `docker run IMAGE serve` both serve on
# every interface of the container: `loraplex serve` binds 127.0.0.1 by default, which nothing outside reaches.
# A later --host in the arguments wins. Any other command runs as `loraplex COMMAND ...`
# (`docker run IMAGE adapters list`, `docker run IMAGE keys create ...`).
set -eu
if [ "$#" -eq 0 ] || [ "$1" = "serve" ]; then
    if [ "$#" -gt 0 ]; then
        shift
    fi
    exec loraplex serve --host "${LORAPLEX_BIND_HOST:-0.0.0.0}" "$@"
fi
exec loraplex "$@"
