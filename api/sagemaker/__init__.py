"""SageMaker's (and any generic) container contract: GET /ping, POST /invocations, port and model artefacts."""
