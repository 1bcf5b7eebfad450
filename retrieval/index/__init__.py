"""Index directories: the faiss index and its kinds, where it is searched (CPU, faiss-gpu or
torch; `placement.py` over `vector_search.py`), the BM25 index, the manifest, and the resumable
builder that writes them.
"""
