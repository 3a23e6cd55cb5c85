"""Evaluation: loss and perplexity on every validation split (splits.py), and lm-eval's tasks through the model
(harness.py). Imports distributed/."""
