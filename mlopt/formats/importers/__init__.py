"""Importers from other tools' formats: TACCL, PyTorch Execution Trace, Kineto."""
