"""Index directories: the faiss index and its kinds, the BM25 index, the manifest, and the
resumable builder that writes them.
"""
