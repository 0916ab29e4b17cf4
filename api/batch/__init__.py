"""OpenAI Files and Batches on the live engine: durable, low-priority batch lines."""
