"""Rollout engines: in-process vLLM and Hugging Face generate."""
