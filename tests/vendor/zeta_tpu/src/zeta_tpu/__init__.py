"""The Zeta TPU: an invented accelerator, the suite's second third-party plugin."""
