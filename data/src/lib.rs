//! Training data for flamia: stream FineWeb-Edu parquet shards, tokenise, pack documents into rows
//! of `seq_len` tokens with their `cu_seqlens`, give each data-parallel rank a disjoint share, and
//! resume exactly from a small serialisable state.
