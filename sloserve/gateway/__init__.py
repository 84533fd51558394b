"""sloserve gateway: KServe V2 (Open Inference Protocol) over REST and gRPC on one DataPlane."""
