package ai.edgepack;

import java.util.Arrays;

/**
 * Name, element type and shape of one model input or output. Immutable.
 *
 * <p>A model compiled for a range of input sizes ({@code edgepack compile ... --dim W=32..1280})
 * has inputs with dynamic dimensions: {@link #shape} reports them as -1 and {@link #dim} gives
 * their name and range ({@code W=32..1280}). Set such an input with {@link
 * NativeModel#setInput(int, java.nio.Buffer, long[])} and the data's actual shape. Outputs whose
 * extents follow a dynamic dimension (or that the model decides at run time) also report -1;
 * {@link NativeModel#outputShape} gives the extents of each run.
 */
public final class TensorInfo {
  private final String name;
  private final DType dtype;
  private final long[] shape;
  private final Dim[] dims; // per axis: the range of a dynamic input dimension, else null

  /**
   * The values a dynamic input dimension takes: {@code min, min + step, ... max}. Immutable.
   */
  public static final class Dim {
    private final String name;
    private final long min;
    private final long max;
    private final long step;

    /**
     * Creates a range.
     *
     * @param name the dimension's name in the build ({@code "W"})
     * @param min the smallest value, at least 1
     * @param max the largest value, at least {@code min}
     * @param step the distance between values, at least 1, dividing {@code max - min}
     * @throws IllegalArgumentException if the values do not form such a range
     */
    public Dim(String name, long min, long max, long step) {
      if (name == null) {
        throw new NullPointerException("name");
      }
      if (min < 1 || max < min || step < 1 || (max - min) % step != 0) {
        throw new IllegalArgumentException(
            "not a range of sizes: " + name + "=" + min + ".." + max + ":" + step);
      }
      this.name = name;
      this.min = min;
      this.max = max;
      this.step = step;
    }

    /**
     * Returns the dimension's name in the build.
     *
     * @return e.g. {@code "W"}
     */
    public String name() {
      return name;
    }

    /**
     * Returns the smallest value.
     *
     * @return the minimum
     */
    public long min() {
      return min;
    }

    /**
     * Returns the largest value.
     *
     * @return the maximum
     */
    public long max() {
      return max;
    }

    /**
     * Returns the distance between the values the dimension takes.
     *
     * @return the step, 1 for every value from min to max
     */
    public long step() {
      return step;
    }

    /**
     * Returns whether the dimension takes {@code value}.
     *
     * @param value a size
     * @return whether {@code min <= value <= max} and {@code value - min} is a multiple of step
     */
    public boolean takes(long value) {
      return value >= min && value <= max && (value - min) % step == 0;
    }

    /**
     * Compares name and range.
     *
     * @param other another object
     * @return whether {@code other} is the same range of the same name
     */
    @Override
    public boolean equals(Object other) {
      if (!(other instanceof Dim)) {
        return false;
      }
      Dim d = (Dim) other;
      return name.equals(d.name) && min == d.min && max == d.max && step == d.step;
    }

    /**
     * Returns a hash of name and range.
     *
     * @return the hash code
     */
    @Override
    public int hashCode() {
      return Arrays.hashCode(new long[] {name.hashCode(), min, max, step});
    }

    /**
     * Returns the range as {@code edgepack compile --dim} writes it.
     *
     * @return e.g. {@code W=32..1280} or {@code W=32..1280:32}
     */
    @Override
    public String toString() {
      return name + "=" + min + ".." + max + (step != 1 ? ":" + step : "");
    }
  }

  /**
   * Creates a description of a tensor with a static shape (or, with -1 extents, an output whose
   * extents each run decides).
   *
   * @param name the tensor name in the model
   * @param dtype the element type
   * @param shape the extents, row-major; empty for a scalar
   */
  public TensorInfo(String name, DType dtype, long[] shape) {
    this(name, dtype, shape, null);
  }

  /**
   * Creates a description of an input with dynamic dimensions.
   *
   * @param name the tensor name in the model
   * @param dtype the element type
   * @param shape the extents, row-major, -1 for a dynamic dimension
   * @param dims per dimension: the range of a dynamic one, {@code null} for a static one (the
   *     array may be {@code null}: no dynamic dimension)
   * @throws IllegalArgumentException if {@code dims} does not match {@code shape}
   */
  public TensorInfo(String name, DType dtype, long[] shape, Dim[] dims) {
    if (name == null || dtype == null || shape == null) {
      throw new NullPointerException("name, dtype and shape must not be null");
    }
    this.name = name;
    this.dtype = dtype;
    this.shape = shape.clone();
    this.dims = dims == null ? new Dim[shape.length] : dims.clone();
    if (this.dims.length != shape.length) {
      throw new IllegalArgumentException(
          "'" + name + "': " + this.dims.length + " ranges for " + shape.length + " dimensions");
    }
    for (int i = 0; i < shape.length; i++) {
      if (this.dims[i] != null && shape[i] != -1) {
        throw new IllegalArgumentException(
            "'" + name + "': dimension " + i + " has a range (" + this.dims[i]
                + ") but a fixed extent " + shape[i]);
      }
    }
  }

  /**
   * Returns the tensor name in the model.
   *
   * @return the name
   */
  public String name() {
    return name;
  }

  /**
   * Returns the element type.
   *
   * @return the dtype
   */
  public DType dtype() {
    return dtype;
  }

  /**
   * Returns the shape (a copy).
   *
   * @return the extents, row-major; -1 for a dynamic dimension (see {@link #dim})
   */
  public long[] shape() {
    return shape.clone();
  }

  /**
   * Returns the range of dimension {@code axis} if it is a dynamic input dimension.
   *
   * @param axis 0-based
   * @return its name and range, or {@code null} for a static dimension (or an output's)
   * @throws IndexOutOfBoundsException for a bad axis
   */
  public Dim dim(int axis) {
    return dims[axis];
  }

  /**
   * Returns whether some extent is not fixed: a dynamic input dimension, or an output dimension
   * that follows one (or that the model decides at run time).
   *
   * @return whether {@link #shape} has a -1
   */
  public boolean isDynamic() {
    for (long d : shape) {
      if (d < 0) {
        return true;
      }
    }
    return false;
  }

  /**
   * Returns the shape with each dynamic input dimension at its largest value: the largest input
   * this tensor takes.
   *
   * @return the extents; an output's run-time dimensions stay -1
   */
  public long[] maxShape() {
    long[] out = shape.clone();
    for (int i = 0; i < out.length; i++) {
      if (dims[i] != null) {
        out[i] = dims[i].max();
      }
    }
    return out;
  }

  /**
   * Returns the number of dimensions.
   *
   * @return the rank, 0 for a scalar
   */
  public int rank() {
    return shape.length;
  }

  /**
   * Returns the number of elements (the product of the shape; with every dynamic input dimension
   * at its largest value).
   *
   * @return the element count, or -1 for an output whose extents each run decides
   */
  public long elementCount() {
    long n = 1;
    for (long d : maxShape()) {
      if (d < 0) {
        return -1;
      }
      n *= d;
    }
    return n;
  }

  /**
   * Returns the dense size in bytes (with every dynamic input dimension at its largest value:
   * enough for any size the input takes).
   *
   * @return element count times element size, or -1 for an output whose extents each run decides
   */
  public long byteSize() {
    long n = elementCount();
    return n < 0 ? -1 : n * dtype.byteSize();
  }

  /**
   * Returns the dense size in bytes of this tensor's dtype at {@code shape}.
   *
   * @param shape extents, e.g. an input's shape in one run
   * @return the product of the extents times the element size
   * @throws IllegalArgumentException for a negative extent
   */
  public long byteSize(long[] shape) {
    long n = dtype.byteSize();
    for (long d : shape) {
      if (d < 0) {
        throw new IllegalArgumentException(
            "'" + name + "': " + Arrays.toString(shape) + " has a negative extent");
      }
      n *= d;
    }
    return n;
  }

  /**
   * Compares name, dtype, shape and the ranges of dynamic dimensions.
   *
   * @param other another object
   * @return whether {@code other} describes the same tensor
   */
  @Override
  public boolean equals(Object other) {
    if (!(other instanceof TensorInfo)) {
      return false;
    }
    TensorInfo t = (TensorInfo) other;
    return name.equals(t.name)
        && dtype == t.dtype
        && Arrays.equals(shape, t.shape)
        && Arrays.equals(dims, t.dims);
  }

  /**
   * Returns a hash of name, dtype, shape and ranges.
   *
   * @return the hash code
   */
  @Override
  public int hashCode() {
    return ((name.hashCode() * 31 + dtype.hashCode()) * 31 + Arrays.hashCode(shape)) * 31
        + Arrays.hashCode(dims);
  }

  /**
   * Returns e.g. {@code 'input' float32 [1, 3, 224, 224]}; a dynamic dimension shows its range
   * ({@code 'x' float32 [1, 3, 48, W=32..1280]}), an output's run-time extent {@code ?}.
   *
   * @return a readable description
   */
  @Override
  public String toString() {
    StringBuilder text = new StringBuilder();
    text.append('\'').append(name).append("' ").append(dtype).append(" [");
    for (int i = 0; i < shape.length; i++) {
      if (i > 0) {
        text.append(", ");
      }
      if (dims[i] != null) {
        text.append(dims[i]);
      } else if (shape[i] < 0) {
        text.append('?');
      } else {
        text.append(shape[i]);
      }
    }
    return text.append(']').toString();
  }
}
