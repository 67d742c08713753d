"""The proof of a vLLM build: the differential suites ``python -m
kvpool.vllm --prove`` runs against the installed vLLM (``kvpool.vllm.prove``
drives them; the repository's tests run the same cases)."""
