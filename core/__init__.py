"""The bottom layer: the project's error types (and the one-line form of a library's error), API keys read from the
environment or `.env`, and whether the Hugging Face Hub can be reached. Every other package may import it and it
imports none of them, so an expected failure raised anywhere in data/, models/, optimizers/ or training/ is the type
that `train_jax.py` catches, and data and models reach the Hub the same way without importing each other."""
