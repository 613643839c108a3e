//! Routed shards and journaled key moves (seed 004).
