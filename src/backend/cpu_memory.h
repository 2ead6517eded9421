// The CPU backend's handles are host addresses: the two conversions between
// them, for the CPU backend's own files and for tests that hand it host
// arrays. Model code never includes this.
#pragma once

#include <type_traits>

#include "backend/backend.h"

namespace glm5::backend::cpu {

template <class T>
T* host(DevPtr<T> p) {
    return reinterpret_cast<T*>(p.handle());
}

template <class T>
DevPtr<T> dev(T* p) {
    return DevPtr<T>::from_handle(
        reinterpret_cast<DeviceMemory*>(const_cast<std::remove_const_t<T>*>(p)));
}

}  // namespace glm5::backend::cpu
