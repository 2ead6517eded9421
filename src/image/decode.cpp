// PNG (libpng) and JPEG (libjpeg-turbo) to 8-bit RGB, matching what Pillow's
// Image.open(...).convert("RGB") gives the reference: palettes and grey
// expanded, 16-bit samples cut to their high byte, alpha dropped without
// compositing, JPEG through the library's default (islow DCT, fancy
// upsampling), no EXIF rotation.
//
// Both libraries report fatal errors through a callback that must not return;
// it longjmps back to a frame that holds no C++ objects with destructors, so
// the jump skips nothing (C++ exceptions must not cross the C libraries).
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include <jpeglib.h>
#include <png.h>

#include "core/error.h"
#include "image/image.h"

namespace glm5::image {

namespace {

struct Failure {
    std::jmp_buf jump;
    char message[256] = {0};
    char warning[256] = {0};  // libpng's last warning: often the detail of its error
    std::string text() const {
        std::string s = message;
        if (warning[0]) s += std::string(" (") + warning + ")";
        return s;
    }
};

void check_dims(uint64_t w, uint64_t h, const std::string& what) {
    if (w == 0 || h == 0)
        throw Error(what + ": the image is " + std::to_string(w) + " x " + std::to_string(h) +
                    " pixels (a side is zero)");
    if (w * h > uint64_t(kMaxPixels))
        throw Error(what + ": the image is " + std::to_string(w) + " x " + std::to_string(h) +
                    " pixels, more than the " + std::to_string(kMaxPixels) + " accepted");
}

// ---- PNG ------------------------------------------------------------------

struct PngSource {
    const uint8_t* p;
    size_t n, at;
};

void png_read_mem(png_structp png, png_bytep out, png_size_t len) {
    auto* s = static_cast<PngSource*>(png_get_io_ptr(png));
    if (len > s->n - s->at) png_error(png, "the file ends early (truncated)");
    std::memcpy(out, s->p + s->at, len);
    s->at += len;
}

void png_fail(png_structp png, png_const_charp msg) {
    auto* f = static_cast<Failure*>(png_get_error_ptr(png));
    std::snprintf(f->message, sizeof f->message, "%s", msg);
    std::longjmp(f->jump, 1);
}

void png_warn(png_structp png, png_const_charp msg) {
    auto* f = static_cast<Failure*>(png_get_error_ptr(png));
    std::snprintf(f->warning, sizeof f->warning, "%s", msg);
}

// Plain-data frame for setjmp: returns false with f.message set on failure.
// Phase 1 (rows == nullptr) reads the header into *w, *h; phase 2 the pixels.
bool png_run(const uint8_t* bytes, size_t n, Failure& f, uint32_t* w, uint32_t* h, uint8_t* rgb) {
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &f, png_fail, png_warn);
    if (!png) {
        std::snprintf(f.message, sizeof f.message, "out of memory");
        return false;
    }
    png_infop info = png_create_info_struct(png);
    png_bytep* volatile rows = nullptr;  // read after a longjmp
    PngSource src{bytes, n, 0};
    if (setjmp(f.jump)) {
        std::free(rows);
        png_destroy_read_struct(&png, &info, nullptr);
        return false;
    }
    if (!info) png_error(png, "out of memory");
    // The caller checks the size before any pixel memory is taken; libpng's
    // own limit (1,000,000 per side) stays as a second guard.
    png_set_read_fn(png, &src, png_read_mem);
    png_read_info(png, info);
    *w = png_get_image_width(png, info);
    *h = png_get_image_height(png, info);
    if (rgb) {
        const int type = png_get_color_type(png, info);
        png_set_strip_16(png);  // the high byte, as Pillow's RGB;16B unpacking
        png_set_packing(png);
        if (type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
        if (type == PNG_COLOR_TYPE_GRAY && png_get_bit_depth(png, info) < 8)
            png_set_expand_gray_1_2_4_to_8(png);
        if (type == PNG_COLOR_TYPE_GRAY || type == PNG_COLOR_TYPE_GRAY_ALPHA)
            png_set_gray_to_rgb(png);
        png_set_strip_alpha(png);  // a tRNS chunk is ignored: no expansion asked for
        png_set_interlace_handling(png);
        png_read_update_info(png, info);
        if (png_get_rowbytes(png, info) != size_t(*w) * 3)
            png_error(png, "unexpected row layout after conversion to RGB");
        rows = static_cast<png_bytep*>(std::malloc(sizeof(png_bytep) * *h));
        if (!rows) png_error(png, "out of memory");
        for (uint32_t y = 0; y < *h; ++y) rows[y] = rgb + size_t(y) * size_t(*w) * 3;
        png_read_image(png, rows);
        png_read_end(png, nullptr);
    }
    std::free(rows);
    png_destroy_read_struct(&png, &info, nullptr);
    return true;
}

Rgb8 decode_png(std::span<const uint8_t> b, const std::string& what) {
    Failure f;
    uint32_t w = 0, h = 0;
    if (!png_run(b.data(), b.size(), f, &w, &h, nullptr))
        throw Error(what + ": not a decodable PNG: " + f.text());
    check_dims(w, h, what);
    Rgb8 img;
    img.width = w;
    img.height = h;
    img.data.resize(size_t(w) * h * 3);
    if (!png_run(b.data(), b.size(), f, &w, &h, img.data.data()))
        throw Error(what + ": not a decodable PNG: " + f.text());
    return img;
}

// ---- JPEG -----------------------------------------------------------------

struct JpegErr {
    jpeg_error_mgr mgr;
    Failure* f;
};

void jpeg_fail(j_common_ptr c) {
    auto* e = reinterpret_cast<JpegErr*>(c->err);
    char buf[JMSG_LENGTH_MAX];
    (*c->err->format_message)(c, buf);
    std::snprintf(e->f->message, sizeof e->f->message, "%s", buf);
    std::longjmp(e->f->jump, 1);
}

// A corrupt-data warning means the decoder made up pixels: refuse the file
// rather than encode garbage.
void jpeg_warn(j_common_ptr c, int level) {
    if (level < 0) jpeg_fail(c);
}

bool jpeg_run(const uint8_t* bytes, size_t n, Failure& f, uint32_t* w, uint32_t* h, uint8_t* rgb) {
    jpeg_decompress_struct d;
    JpegErr err;
    d.err = jpeg_std_error(&err.mgr);
    err.mgr.error_exit = jpeg_fail;
    err.mgr.emit_message = jpeg_warn;
    err.f = &f;
    if (setjmp(f.jump)) {
        jpeg_destroy_decompress(&d);
        return false;
    }
    jpeg_create_decompress(&d);
    jpeg_mem_src(&d, bytes, static_cast<unsigned long>(n));
    jpeg_read_header(&d, TRUE);
    *w = d.image_width;
    *h = d.image_height;
    if (rgb) {
        if (d.jpeg_color_space == JCS_CMYK || d.jpeg_color_space == JCS_YCCK) {
            std::snprintf(f.message, sizeof f.message, "CMYK JPEGs are not supported");
            jpeg_destroy_decompress(&d);
            return false;
        }
        d.out_color_space = JCS_RGB;
        jpeg_start_decompress(&d);
        if (d.output_components != 3 || d.output_width != *w || d.output_height != *h) {
            std::snprintf(f.message, sizeof f.message, "unexpected output layout");
            jpeg_destroy_decompress(&d);
            return false;
        }
        while (d.output_scanline < d.output_height) {
            JSAMPROW row = rgb + size_t(d.output_scanline) * size_t(*w) * 3;
            jpeg_read_scanlines(&d, &row, 1);
        }
        jpeg_finish_decompress(&d);
    }
    jpeg_destroy_decompress(&d);
    return true;
}

Rgb8 decode_jpeg(std::span<const uint8_t> b, const std::string& what) {
    Failure f;
    uint32_t w = 0, h = 0;
    if (!jpeg_run(b.data(), b.size(), f, &w, &h, nullptr))
        throw Error(what + ": not a decodable JPEG: " + f.text());
    check_dims(w, h, what);
    Rgb8 img;
    img.width = w;
    img.height = h;
    img.data.resize(size_t(w) * h * 3);
    if (!jpeg_run(b.data(), b.size(), f, &w, &h, img.data.data()))
        throw Error(what + ": not a decodable JPEG: " + f.text());
    return img;
}

}  // namespace

Dims dimensions(std::span<const uint8_t> b, const std::string& what) {
    static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    Failure f;
    uint32_t w = 0, h = 0;
    if (b.size() >= 8 && std::memcmp(b.data(), kPng, 8) == 0) {
        if (!png_run(b.data(), b.size(), f, &w, &h, nullptr))
            throw Error(what + ": not a decodable PNG: " + f.text());
    } else if (b.size() >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) {
        if (!jpeg_run(b.data(), b.size(), f, &w, &h, nullptr))
            throw Error(what + ": not a decodable JPEG: " + f.text());
    } else {
        decode(b, what);  // throws the reason: empty, or another format
    }
    check_dims(w, h, what);
    return {int64_t(w), int64_t(h)};
}

Rgb8 decode(std::span<const uint8_t> b, const std::string& what) {
    static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (b.size() >= 8 && std::memcmp(b.data(), kPng, 8) == 0) return decode_png(b, what);
    if (b.size() >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) return decode_jpeg(b, what);
    if (b.empty()) throw Error(what + ": the image is empty (0 bytes)");
    throw Error(what + ": not a PNG or JPEG image (unrecognised signature)");
}

std::vector<uint8_t> read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error(path + ": cannot open the image file");
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)),
                               std::istreambuf_iterator<char>());
    if (f.bad()) throw Error(path + ": read error");
    return bytes;
}

Rgb8 load_file(const std::string& path) {
    return decode(read_file(path), path);
}

}  // namespace glm5::image
