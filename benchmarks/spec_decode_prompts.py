"""The fixed prompts of the speculative-decoding benchmark (batch 1, code): 24 that ask for new code (the draft
model's case) and 8 that contain most of their answer (rewrites: the n-gram proposer's case). Run as a script,
it prints them as JSON, one chat message list per prompt, for `brisk bench` or a peer engine."""

from __future__ import annotations

import json

WRITE = [
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Write a Python function that checks whether a string is a palindrome, ignoring case and punctuation.",
    "Write a Python class for a stack with push, pop, peek and is_empty methods.",
    "Write a Python function that merges two sorted lists into one sorted list.",
    "Write a Python function that counts the words in a text file and returns the ten most common.",
    "Write a binary search function in Python that returns the index of a target or -1.",
    "Write a Python function that flattens an arbitrarily nested list.",
    "Write a Python decorator that retries a function up to three times when it raises an exception.",
    "Write a Python function that parses a CSV file into a list of dictionaries without the csv module.",
    "Write a Python generator that yields the prime numbers below a given limit.",
    "Write a Python function that computes the Levenshtein distance between two strings.",
    "Write a Python class for an LRU cache with get and put in O(1).",
    "Write a JavaScript function that debounces another function.",
    "Write a JavaScript function that deep-clones a plain object.",
    "Write a SQL query that returns the five customers with the highest total order amount.",
    "Write a Bash script that renames every .jpeg file in a folder to .jpg.",
    "Write a C function that reverses a singly linked list in place.",
    "Write a Rust function that returns the largest element of a slice of i32, or None when it is empty.",
    "Write a Go function that reads a file line by line and counts the lines.",
    "Write a Python function that validates an email address with a regular expression.",
    "Write a Python function that converts a Roman numeral to an integer.",
    "Write a Python function that groups a list of words into anagram groups.",
    "Write a Python dataclass for a 2D point with distance and midpoint methods.",
    "Write pytest tests for a function add(a, b) that adds two numbers.",
]

_FUNCTION = '''def total_price(items, tax_rate):
    total = 0
    for item in items:
        total += item["price"] * item["quantity"]
    return total * (1 + tax_rate)
'''
_CLASS = '''class Counter:
    def __init__(self):
        self.counts = {}

    def add(self, key):
        self.counts[key] = self.counts.get(key, 0) + 1

    def most_common(self, n):
        return sorted(self.counts.items(), key=lambda kv: kv[1], reverse=True)[:n]
'''
REWRITE = [
    f"Rewrite this function with a docstring and type hints:\n\n{_FUNCTION}",
    f"Rename the variable total to subtotal in this function and return the whole function:\n\n{_FUNCTION}",
    f"Add input validation (raise ValueError for a negative tax_rate) to this function:\n\n{_FUNCTION}",
    f"Add a docstring to every method of this class and return the whole class:\n\n{_CLASS}",
    f"Add type hints to this class and return the whole class:\n\n{_CLASS}",
    f"Add a reset method to this class and return the whole class:\n\n{_CLASS}",
    f"Convert this function to use sum() with a generator expression; return the whole function:\n\n{_FUNCTION}",
    f"Rewrite this class so that counts is a collections.Counter; return the whole class:\n\n{_CLASS}",
]
PROMPTS = WRITE + REWRITE
assert len(PROMPTS) == 32


def messages(prompts: list[str] = PROMPTS) -> list[list[dict]]:
    return [[{"role": "user", "content": prompt}] for prompt in prompts]


if __name__ == "__main__":
    print(json.dumps(messages(), indent=1))
