// Chunk hashes of device memory for capture windows (shim_window.c): out[c] gets a 64-bit
// hash of chunk c (chunk_words 16-byte words each, the last one may be shorter) of the range
// at p. Order- and position-sensitive: a sum of mixed (word, index) pairs, reduced per warp
// and added atomically, so any number of blocks may share a chunk. Not cryptographic: it
// only tells a changed chunk from an unchanged one. The shim embeds the PTX nvcc makes of
// this file (shim_hash_ptx.h: `python shim/gen_hash_ptx.py`), loaded with interception paused.
typedef unsigned long long u64;

__device__ __forceinline__ u64 cs_mix(u64 a, u64 b, u64 i) {
    u64 h = (a ^ (i * 0x9E3779B97F4A7C15ull)) * 0xBF58476D1CE4E5B9ull;
    h ^= (b + i) * 0x94D049BB133111EBull;
    h ^= h >> 31;
    return h * 0xD6E8FEB86659FD93ull;
}

extern "C" __global__ void cs_hash_chunks(const uint4 *__restrict__ p, u64 nwords, u64 chunk_words,
                                          unsigned blocks_per_chunk, u64 *out) {
    u64 chunk = blockIdx.x / blocks_per_chunk;
    u64 part = blockIdx.x % blocks_per_chunk;
    u64 start = chunk * chunk_words;
    u64 end = start + chunk_words < nwords ? start + chunk_words : nwords;
    u64 acc = 0;
    u64 stride = (u64)blocks_per_chunk * blockDim.x;
    for (u64 i = start + part * blockDim.x + threadIdx.x; i < end; i += stride) {
        uint4 v = __ldcs(p + i);
        u64 a = ((u64)v.y << 32) | v.x, b = ((u64)v.w << 32) | v.z;
        acc += cs_mix(a, b, i - start);
    }
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0 && start < end) atomicAdd(out + chunk, acc);
}
