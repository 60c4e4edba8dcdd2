"""One module per kind of plan (Amoro: a planner per optimizing type), each behind `Strategy`.
planning/planner.py tries them in its order; the first that plans a partition wins."""
