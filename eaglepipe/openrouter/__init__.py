"""The paid generation stage: routing policy, API key, request fingerprint, journal, async client."""
