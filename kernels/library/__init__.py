"""Kernel implementations (providers) a kernel proposal copies into the fork. Each file is plain torch /
Triton code with the IR op's exact signature; ``kernels.fork`` adds the registration block."""
