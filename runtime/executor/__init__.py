"""The executor: runs the model for the scheduler. ``worker.py`` (rank 0's model, KV pool,
attention backend, one forward and sampling per step), ``tp_worker.py`` (tensor-parallel
ranks 1..N-1), ``kv_pool.py`` (the K/V tensors), ``cuda_graph_runner.py`` and
``device_req_to_token.py`` (decode CUDA graphs and the slot table they read on the GPU),
``compute_threads.py`` (fewer CPU threads while other processes keep cores busy)."""
