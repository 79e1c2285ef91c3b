"""pdkit: SGLang prefill/decode disaggregated serving, laid down by pyinfra from one validated spec."""

__version__ = "0.1.0"
