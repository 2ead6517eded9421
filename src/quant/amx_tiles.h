// The tile shape every AMX kernel of the project uses: all eight tiles 16
// rows of 64 bytes (palette 1), configured at the start of each kernel call
// and released at its end (a thread holding tile state makes the OS save 8 KiB
// more at every switch). For the *_amx.cpp files (compiled with AMX-TILE).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace glm5::quant {

inline void configure_amx_tiles() {
    struct alignas(64) TileConfig {
        uint8_t palette = 1;
        uint8_t start_row = 0;
        uint8_t reserved[14] = {};
        uint16_t colsb[16] = {};
        uint8_t rows[16] = {};
    } c;
    for (int i = 0; i < 8; ++i) {
        c.colsb[i] = 64;
        c.rows[i] = 16;
    }
    _tile_loadconfig(&c);
}

// The tiles are the thread's from construction to destruction.
struct AmxTiles {
    AmxTiles() { configure_amx_tiles(); }
    ~AmxTiles() { _tile_release(); }
    AmxTiles(const AmxTiles&) = delete;
    AmxTiles& operator=(const AmxTiles&) = delete;
};

}  // namespace glm5::quant
