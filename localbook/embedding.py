"""Embeddings as local means (LLE, asymmetric MDS, triplet/ordinal embeddings)."""
__all__ = []
