"""CompileMask: ahead-of-time compiler from attention-mask descriptions to GPU kernels."""

__version__ = "0.1.0"
