"""tinytrain: compile a neural network into on-device training firmware for microcontrollers."""

__version__ = "0.1.0"
