"""Speculative decoding: a cheap proposer guesses the next tokens, the target model checks them in one step."""
