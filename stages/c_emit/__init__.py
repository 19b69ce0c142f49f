"""C emission helpers of the codegen stage: the program skeleton, the embeddable C API, the emulate-run driver and C literals."""
