"""Hugging Face transformers: a small GPT-2 built from a config (random weights, nothing
downloaded) generating 24 tokens greedily with its KV cache through SDPA attention, then a
BERT-style encoder's forward pass with an attention mask. fp32, deterministic algorithms."""
import hashlib
import torch
from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
torch.backends.cuda.matmul.allow_tf32 = False
dev = "cuda"
cfg = GPT2Config(n_layer=4, n_head=8, n_embd=256, vocab_size=4096, n_positions=128, attn_implementation="sdpa")
gpt = GPT2LMHeadModel(cfg).to(dev).eval()
prompt = torch.randint(0, cfg.vocab_size, (2, 16), device=dev)
with torch.no_grad():
    out = gpt.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=24, do_sample=False,
                       pad_token_id=0, use_cache=True)
print("generated", out[:, 16:].tolist())
bcfg = BertConfig(num_hidden_layers=2, hidden_size=128, num_attention_heads=4, intermediate_size=256, vocab_size=2048)
bert = BertModel(bcfg).to(dev).eval()
ids = torch.randint(0, bcfg.vocab_size, (4, 32), device=dev)
mask = torch.ones_like(ids); mask[:, 24:] = 0
with torch.no_grad():
    h = bert(input_ids=ids, attention_mask=mask).last_hidden_state
print("bert", tuple(h.shape), hashlib.sha256(h.cpu().numpy().round(4).tobytes()).hexdigest()[:24])
