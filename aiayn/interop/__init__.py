"""Interoperability with other libraries' checkpoints (Hugging Face ``transformers``)."""
