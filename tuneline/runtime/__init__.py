"""The machine and the process contract: accelerators, installed requirements, DeepSpeed/FP8 launch settings, a Ray
cluster's reachability, and what the flow's process and the training child agree on."""
