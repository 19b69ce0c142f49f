"""The device side: the board registry, launching firmware in QEMU or natively, cycle estimates and reading trained weights back out."""
