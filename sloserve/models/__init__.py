"""Model repository (``<repo>/<model>/config.json`` + ``<repo>/<model>/<variant>/model.onnx``),
ONNX Runtime replicas, and the demo-model builder."""
