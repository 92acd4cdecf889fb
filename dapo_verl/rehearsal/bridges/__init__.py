"""What only a CPU rehearsal loads into verl's and vLLM's processes: the CPU platform and its verl plugin
(``VERL_USE_EXTERNAL_MODULES=dapo_verl.rehearsal.bridges.cpu_plugin``), the CPU rollout replica that stands in for
vLLM, the vLLM-on-CPU bridge and its plugin, the checkpoint engine over ZeroMQ, the resume barrier, the weight probe,
per-request seeds and the shared memory a run leaves. A cluster run loads none of it (``dapo_verl/adapter/`` is what it
loads; ``tests/unit/test_package_layout.py``). Importing this package imports nothing.
"""
