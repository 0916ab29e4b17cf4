"""Code that runs inside vLLM's engine-core and worker processes: the LoRA isolation fix, the grouped LoRA ops,
the guard that ends those processes with the server, and the plugin entry point that installs them.
`batch_plan`, `grouped_ops` and `fused_ops` are plain torch (no vLLM); `isolation`, `punica` and `plugin`
patch vLLM."""
