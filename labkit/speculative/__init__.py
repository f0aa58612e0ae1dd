"""Speculative decoding: drafters (`drafters`; heads on a frozen backbone: the chained MTP head in `mtp`, the
zero-copy and parallel heads in `heads`, what they read of the target in `tap`, on file in `headfile`), exact
verification (`verify`), the decoding loop (`decode`), the measured costs and the speed-up formula (`costs`),
drafters raced against plain decoding (`study`); token trees verified in one pass (`tree`: the tree and its
verification, `treedraft`: tree drafters, `treedecode`: the loop)."""
from labkit.speculative.decode import GAMMA_MAX, SpeculativeOutput, expected_tokens, generate
from labkit.speculative.drafters import DraftModel, LayerSkip, PromptLookup
from labkit.speculative.heads import MedusaDrafter, MedusaHeads, ZeroCopyDrafter, ZeroCopyHead
from labkit.speculative.headfile import load_head, save_head
from labkit.speculative.mtp import MTPDrafter, MTPHead
from labkit.speculative.tree import TokenTree, verify_greedy, verify_sampled
from labkit.speculative.treedecode import TreeCache, TreeOutput, generate_tree, tree_logits, verify_tree
from labkit.speculative.treedraft import ChainTree, TreeDraftModel, TreeLookup
from labkit.speculative.verify import accept_greedy, accept_sampled, residual

__all__ = ["generate", "SpeculativeOutput", "expected_tokens", "GAMMA_MAX", "DraftModel", "PromptLookup", "LayerSkip",
           "MTPHead", "MTPDrafter", "ZeroCopyHead", "ZeroCopyDrafter", "MedusaHeads", "MedusaDrafter", "load_head",
           "save_head", "accept_greedy", "accept_sampled", "residual",
           "TokenTree", "verify_greedy", "verify_sampled", "TreeCache", "TreeOutput", "generate_tree", "tree_logits",
           "verify_tree", "TreeLookup", "TreeDraftModel", "ChainTree"]
