"""Data: where it lives, reading text files, tokenizers."""
