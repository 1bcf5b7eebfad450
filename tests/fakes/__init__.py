"""In-repo fakes that honour the real interfaces, for tests that need control over failures."""
