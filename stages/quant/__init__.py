"""Quantization: post-training int8 quantization and calibration, QAS updates, and the plan-time check that int8 updates do not vanish."""
