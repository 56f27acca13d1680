// The stb_image implementation, for systems whose stb comes as the header only.
#define STB_IMAGE_IMPLEMENTATION
#include <stb_image.h>
