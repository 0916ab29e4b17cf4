"""The routing step between resolving a request's `model` and admitting it: rollouts (canary, sticky A/B,
shadow), their automatic rollback, fallback chains and circuit breakers."""
