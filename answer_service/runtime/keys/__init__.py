"""API keys and their limits: the key file (`auth`), its reload without a restart
(`key_watch`) and the per-key rate limits (`rate_limit`)."""
