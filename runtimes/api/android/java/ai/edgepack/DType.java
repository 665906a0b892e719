package ai.edgepack;

import java.nio.Buffer;
import java.nio.ByteBuffer;
import java.nio.DoubleBuffer;
import java.nio.FloatBuffer;
import java.nio.IntBuffer;
import java.nio.LongBuffer;
import java.nio.ShortBuffer;

/** Element type of a tensor; the codes are those of the C API's {@code ep_dtype}. */
public enum DType {
  /** 32-bit IEEE float; Java buffer: {@link FloatBuffer}. */
  FLOAT32(1, "float32", 4, FloatBuffer.class),
  /** 16-bit IEEE float (raw bits); Java buffer: {@link ShortBuffer}. */
  FLOAT16(2, "float16", 2, ShortBuffer.class),
  /** bfloat16 (raw bits); Java buffer: {@link ShortBuffer}. */
  BFLOAT16(3, "bfloat16", 2, ShortBuffer.class),
  /** 64-bit IEEE float; Java buffer: {@link DoubleBuffer}. */
  FLOAT64(4, "float64", 8, DoubleBuffer.class),
  /** Signed 8-bit integer; Java buffer: {@link ByteBuffer}. */
  INT8(5, "int8", 1, ByteBuffer.class),
  /** Signed 16-bit integer; Java buffer: {@link ShortBuffer}. */
  INT16(6, "int16", 2, ShortBuffer.class),
  /** Signed 32-bit integer; Java buffer: {@link IntBuffer}. */
  INT32(7, "int32", 4, IntBuffer.class),
  /** Signed 64-bit integer; Java buffer: {@link LongBuffer}. */
  INT64(8, "int64", 8, LongBuffer.class),
  /** Unsigned 8-bit integer; Java buffer: {@link ByteBuffer}. */
  UINT8(9, "uint8", 1, ByteBuffer.class),
  /** Unsigned 16-bit integer; Java buffer: {@link ShortBuffer}. */
  UINT16(10, "uint16", 2, ShortBuffer.class),
  /** Unsigned 32-bit integer; Java buffer: {@link IntBuffer}. */
  UINT32(11, "uint32", 4, IntBuffer.class),
  /** Unsigned 64-bit integer; Java buffer: {@link LongBuffer}. */
  UINT64(12, "uint64", 8, LongBuffer.class),
  /** Boolean, one byte per element; Java buffer: {@link ByteBuffer}. */
  BOOL(13, "bool", 1, ByteBuffer.class),
  /** 8-bit float E4M3 (finite, NaN), raw bits; Java buffer: {@link ByteBuffer}. */
  FLOAT8_E4M3FN(14, "float8_e4m3fn", 1, ByteBuffer.class),
  /** 8-bit float E4M3 (finite, unsigned zero, NaN), raw bits; Java buffer: {@link ByteBuffer}. */
  FLOAT8_E4M3FNUZ(15, "float8_e4m3fnuz", 1, ByteBuffer.class),
  /** 8-bit float E5M2 (IEEE-like), raw bits; Java buffer: {@link ByteBuffer}. */
  FLOAT8_E5M2(16, "float8_e5m2", 1, ByteBuffer.class),
  /** 8-bit float E5M2 (finite, unsigned zero, NaN), raw bits; Java buffer: {@link ByteBuffer}. */
  FLOAT8_E5M2FNUZ(17, "float8_e5m2fnuz", 1, ByteBuffer.class),
  /** 8-bit power of two E8M0 (unsigned, NaN), raw bits; Java buffer: {@link ByteBuffer}. */
  FLOAT8_E8M0FNU(18, "float8_e8m0fnu", 1, ByteBuffer.class);

  private final int code;
  private final String metaName;
  private final int size;
  private final Class<? extends Buffer> bufferClass;

  DType(int code, String metaName, int size, Class<? extends Buffer> bufferClass) {
    this.code = code;
    this.metaName = metaName;
    this.size = size;
    this.bufferClass = bufferClass;
  }

  /**
   * Returns the C API code ({@code ep_dtype}).
   *
   * @return the code, 1 for float32 ... 18 for float8_e8m0fnu
   */
  public int code() {
    return code;
  }

  /**
   * Returns the size of one element in bytes.
   *
   * @return 1, 2, 4 or 8
   */
  public int byteSize() {
    return size;
  }

  /**
   * Returns the typed NIO buffer class that holds elements of this type. A {@link ByteBuffer}
   * of raw bytes is accepted for every type.
   *
   * @return e.g. {@code FloatBuffer.class} for {@link #FLOAT32}
   */
  public Class<? extends Buffer> bufferClass() {
    return bufferClass;
  }

  /**
   * Returns the name used in edgepack's metadata and manifests.
   *
   * @return e.g. {@code "float32"}
   */
  @Override
  public String toString() {
    return metaName;
  }

  /**
   * Returns the dtype with the given C API code.
   *
   * @param code an {@code ep_dtype} value
   * @return the dtype
   * @throws EdgepackException (status {@link EdgepackException#DTYPE}) for an unknown code
   */
  public static DType fromCode(int code) {
    for (DType d : values()) {
      if (d.code == code) {
        return d;
      }
    }
    throw new EdgepackException("unknown dtype code " + code, EdgepackException.DTYPE);
  }
}
