"""The target model: building the embedded one, loading any, rendering its prompts."""
