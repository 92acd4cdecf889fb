"""Reliability checks that try to break dapo_verl: fuzzing, sampler stress, fault injection, determinism."""
