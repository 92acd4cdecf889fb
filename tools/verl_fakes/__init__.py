"""Strict stand-ins for the parts of verl's v1 trainer that a CPU machine cannot run at scale -- the rollout's agent
loop (:mod:`.v1_rollout`) and the trainer's step (:mod:`.v1_trainer`) -- for the tests and benchmarks of the replay
buffer; each module says where it departs from verl."""
