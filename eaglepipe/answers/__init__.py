"""Where a set's answers come from besides OpenRouter: the team's own engine, or answers it already has."""
