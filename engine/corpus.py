"""English text about serving engines: what the tiny model's byte-level BPE
tokenizer is trained on, and what the serving benchmark pads questions with."""

TRAINING_CORPUS = """\
A language model serving engine turns a trained network into a service that many people can use at the same time. Each request arrives as a prompt, a sequence of tokens, and leaves as a stream of generated tokens. The engine decides which requests run together, where their state lives in memory, and how each step of the model is computed.

Generation has two phases. During prefill the engine reads the whole prompt in one pass and writes the keys and values of every layer into the key value cache. During decode it produces one new token per sequence per step, reading the cache to attend to everything that came before. Prefill is limited by compute, decode is limited by memory bandwidth, and a good scheduler mixes the two so that neither the arithmetic units nor the memory sit idle.

Attention compares the query of the current token with the keys of all earlier tokens, turns the scores into weights with a softmax, and returns a weighted sum of the values. Grouped query attention lets several query heads share one key head and one value head, which shrinks the cache by the same factor without changing the shape of the computation very much. Rotary position embeddings rotate queries and keys by an angle that depends on the position, so relative distance shows up directly in the scores.

The cache grows with every token, and sequences finish at different times, so storing each sequence in one contiguous buffer wastes memory. Paged attention splits the cache into fixed size blocks, much like pages of virtual memory. A page table lists the blocks that belong to each sequence, blocks are allocated when a sequence grows and returned to a free list when it ends, and the attention kernel follows the page table instead of assuming contiguous storage.

Many requests begin with the same text: a system prompt, a set of instructions, or a shared document. A prefix cache remembers the blocks that hold such a prefix, keyed by a hash of the tokens, so a new request that starts the same way can reuse them instead of computing them again. Reference counts record how many sequences point at each block, and a block is only freed when the last of them lets go.

Cascade attention goes one step further. When a batch of sequences shares a long prefix, the engine reads the shared blocks once for the whole group and the private blocks once for each member, then merges the two partial results with their softmax statistics. The answer is the same as ordinary attention, but the shared part of the cache is read from memory only once per step instead of once per sequence.

Continuous batching lets requests join and leave between steps rather than waiting for a whole batch to finish. When memory runs short, a new request waits in a queue, or a running one is preempted and recomputed later. Metrics such as tokens per second, step latency, queue length and cache occupancy tell an operator how the engine behaves under load, and a dashboard makes those numbers easy to watch.

Sampling chooses the next token from the logits. Greedy decoding always takes the most likely token, which makes the output repeatable and easy to test. Temperature, top p and top k sampling trade some of that certainty for variety. Stop tokens end a sequence, and a maximum token count bounds the cost of every request.

Quantization stores weights with fewer bits, which saves memory and bandwidth at a small cost in accuracy. Kernels fuse several small operations into one launch to avoid writing intermediate results to memory. Careful engineering of these details is what separates a fast engine from a slow one running the very same model.
"""
