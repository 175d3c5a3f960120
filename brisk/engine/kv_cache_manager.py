"""Paged KV cache bookkeeping in plain Python: blocks, reference counts and the prefix cache.

A block holds ``block_size`` consecutive tokens of one sequence. A *full* block is identified by a hash chained
over its tokens and its parent's hash, so equal prefixes map to equal hashes. Blocks whose reference count drops
to zero go to the tail of the free queue but keep their hash: a later request with the same prefix takes them
back (a prefix-cache hit) until they are reused for something else, oldest first (LRU eviction).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from brisk.engine.request import Request

BlockHash = int


def hash_block_tokens(parent_hash: BlockHash | None, tokens: Sequence[int]) -> BlockHash:
    return hash((parent_hash, tuple(tokens)))


def salt_hash(cache_salt: str | None) -> BlockHash | None:
    """The first block's parent: None, or the request's ``cache_salt`` (vLLM's), which every later hash chains
    from, so requests of different salts never share a cached block (one tenant cannot time another's prompts)."""
    return None if cache_salt is None else hash(("cache_salt", cache_salt))


@dataclass(eq=False)
class KVBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None


class BlockPool:
    """Owns every block: the free queue (LRU order) and the hash -> block map of cached full blocks."""

    def __init__(self, num_blocks: int, enable_caching: bool):
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        # Free blocks in eviction order (front = evicted first). Ordered dict: O(1) removal from the middle.
        self.free_queue: OrderedDict[int, KVBlock] = OrderedDict((b.block_id, b) for b in self.blocks)
        self.cached: dict[BlockHash, KVBlock] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def get_cached_block(self, block_hash: BlockHash) -> KVBlock | None:
        return self.cached.get(block_hash)

    def allocate(self, count: int) -> list[KVBlock]:
        if count > len(self.free_queue):
            raise RuntimeError(f"asked for {count} blocks with {len(self.free_queue)} free")
        blocks = []
        for _ in range(count):
            _, block = self.free_queue.popitem(last=False)
            if block.block_hash is not None:  # evict its cached content
                if self.cached.get(block.block_hash) is block:
                    del self.cached[block.block_hash]
                block.block_hash = None
            block.ref_cnt = 1
            blocks.append(block)
        return blocks

    def touch(self, blocks: Sequence[KVBlock]) -> None:
        """Take a reference on cached blocks (a prefix hit), pulling free ones out of the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self.free_queue[block.block_id]
            block.ref_cnt += 1

    def free(self, blocks: Sequence[KVBlock]) -> None:
        """Drop one reference on each block; callers pass tail blocks first so they are evicted first."""
        for block in blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue[block.block_id] = block

    def release_unused(self, blocks: Sequence[KVBlock]) -> None:
        """Give back blocks that hold nothing worth keeping (no hash): they go to the front of the free queue,
        to be reused before any block whose cached prefix could still be hit."""
        for block in blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue[block.block_id] = block
                self.free_queue.move_to_end(block.block_id, last=False)

    def cache_block(self, block: KVBlock, block_hash: BlockHash) -> None:
        block.block_hash = block_hash
        self.cached.setdefault(block_hash, block)

    def reset_prefix_cache(self) -> bool:
        if any(b.ref_cnt for b in self.blocks):
            return False
        for block in self.blocks:
            block.block_hash = None
        self.cached.clear()
        return True


class KVCacheManager:
    """Maps requests to their blocks; finds prefix hits and allocates slots for scheduled tokens."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool):
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.pool = BlockPool(num_blocks, enable_caching)
        self.req_to_blocks: dict[str, list[KVBlock]] = {}
        self.req_to_block_ids: dict[str, list[int]] = {}  # the block table, kept in step with req_to_blocks
        self.req_to_hashes: dict[str, list[BlockHash]] = {}
        self.req_to_num_cached: dict[str, int] = {}  # leading blocks of the request already published
        self.prefix_cache_queries = 0  # tokens looked up
        self.prefix_cache_hits = 0  # tokens found

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def usage(self) -> float:
        return self.pool.usage()

    def _block_hashes(self, request: Request) -> list[BlockHash]:
        """Hashes of the request's full blocks, extended incrementally as tokens arrive."""
        hashes = self.req_to_hashes.setdefault(request.request_id, [])
        tokens = request.all_token_ids
        bs = self.block_size
        while (len(hashes) + 1) * bs <= len(tokens):
            start = len(hashes) * bs
            parent = hashes[-1] if hashes else salt_hash(request.cache_salt)
            hashes.append(hash_block_tokens(parent, tokens[start : start + bs]))
        return hashes

    def get_computed_blocks(self, request: Request) -> tuple[list[KVBlock], int]:
        """The longest cached prefix of a new request, in whole blocks, leaving at least one token to compute."""
        if not self.enable_caching:
            return [], 0
        hashes = self._block_hashes(request)
        max_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[KVBlock] = []
        for block_hash in hashes[:max_blocks]:
            block = self.pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def record_prefix_lookup(self, num_tokens: int, num_hit_tokens: int) -> None:
        """Count one admitted request's lookup (a request that waits for blocks looks up again: counted once)."""
        self.prefix_cache_queries += num_tokens
        self.prefix_cache_hits += num_hit_tokens

    def allocate_slots(
        self, request: Request, num_new_tokens: int, new_computed_blocks: Sequence[KVBlock] = ()
    ) -> bool:
        """Reserve blocks so ``num_new_tokens`` more tokens fit; False (and nothing changed) if they don't."""
        request_id = request.request_id
        blocks = self.req_to_blocks.get(request_id)
        if blocks is None:
            blocks = self.req_to_blocks[request_id] = []
            self.req_to_block_ids[request_id] = []
        total = request.num_computed_tokens + len(new_computed_blocks) * self.block_size + num_new_tokens
        num_required = -(-total // self.block_size) - len(blocks) - len(new_computed_blocks)
        if num_required > 0 or new_computed_blocks:
            # Cached hits that sit in the free queue leave it when touched, so they do not count as free.
            evictable_hits = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
            if num_required > self.pool.num_free_blocks - evictable_hits:
                if not blocks:
                    del self.req_to_blocks[request_id], self.req_to_block_ids[request_id]
                return False
            self.pool.touch(new_computed_blocks)
            new_blocks = list(new_computed_blocks)
            if num_required > 0:
                new_blocks += self.pool.allocate(num_required)
            blocks.extend(new_blocks)
            self.req_to_block_ids[request_id].extend(b.block_id for b in new_blocks)
        if self.enable_caching and total // self.block_size > self.req_to_num_cached.get(request_id, 0):
            self._cache_full_blocks(request, blocks, total)
        return True

    def _cache_full_blocks(self, request: Request, blocks: list[KVBlock], num_tokens: int) -> None:
        """Publish blocks that will be full after this step. Attention writes a step's KV before reading it,
        so another request scheduled later in the same step may already share them."""
        num_full = min(num_tokens, request.num_tokens) // self.block_size
        start = self.req_to_num_cached.get(request.request_id, 0)
        hashes = self._block_hashes(request)
        for i in range(start, num_full):
            if blocks[i].block_hash is None:
                self.pool.cache_block(blocks[i], hashes[i])
        self.req_to_num_cached[request.request_id] = num_full

    def roll_back_slots(self, request: Request) -> None:
        """After a speculative step: the KV of the first ``num_computed_tokens`` tokens is right, the slots past
        it held rejected drafts. Publish the blocks that verified tokens filled, and free the blocks past the
        computed tokens, so the request holds exactly what it would have without speculation. Blocks that held
        rejected drafts never had a hash (only known tokens are hashed), so the prefix cache keeps none of them."""
        blocks = self.req_to_blocks[request.request_id]
        if self.enable_caching:
            self._cache_full_blocks(request, blocks, request.num_computed_tokens)
        keep = -(-request.num_computed_tokens // self.block_size)
        if len(blocks) > keep:
            self.pool.release_unused(blocks[keep:][::-1])
            del blocks[keep:]
            # A new block table, not a shortened one: readers that follow a table by identity and copy only
            # what was appended (the model runner's input buffers) must see the change.
            self.req_to_block_ids[request.request_id] = [b.block_id for b in blocks]

    def free(self, request: Request) -> None:
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.req_to_block_ids.pop(request.request_id, None)
        self.pool.free(list(reversed(blocks)))
        self.req_to_hashes.pop(request.request_id, None)
        self.req_to_num_cached.pop(request.request_id, None)

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table (a live list: read it, do not modify it)."""
        return self.req_to_block_ids[request_id]

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()
