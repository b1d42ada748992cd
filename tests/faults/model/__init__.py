"""The model-based chaos test (tests/faults/test_model_chaos.py): scenarios, the driver that runs them, the checks."""
