"""vLLM's chain length K, measured in vLLM (the sweep itself: eval/serving/k_sweep.py).

./launch.sh vllm-k --checkpoint runs/<run> [--ks 1,2,3,4] [--per-category 2 | --n 8] [--no-write]
"""

from headstart.eval.serving.k_sweep import main

if __name__ == "__main__":
    main()
