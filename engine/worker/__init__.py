"""Code that runs inside vLLM's engine-core and worker processes: the LoRA isolation fix, the grouped LoRA
ops and the plugin entry point that installs them. `batch_plan`, `grouped_ops` and `fused_ops` are plain torch
(no vLLM); `isolation`, `punica` and `plugin` patch vLLM."""
