"""Contention-aware communication thread allocation co-optimised with tensor fusion (LIBRA, Liu et al.)."""
