package ai.edgepack;

import java.util.Arrays;

/** Name, element type and static shape of one model input or output. Immutable. */
public final class TensorInfo {
  private final String name;
  private final DType dtype;
  private final long[] shape;

  /**
   * Creates a description.
   *
   * @param name the tensor name in the model
   * @param dtype the element type
   * @param shape the extents, row-major; empty for a scalar
   */
  public TensorInfo(String name, DType dtype, long[] shape) {
    if (name == null || dtype == null || shape == null) {
      throw new NullPointerException("name, dtype and shape must not be null");
    }
    this.name = name;
    this.dtype = dtype;
    this.shape = shape.clone();
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
   * @return the extents, row-major
   */
  public long[] shape() {
    return shape.clone();
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
   * Returns the number of elements (the product of the shape).
   *
   * @return the element count
   */
  public long elementCount() {
    long n = 1;
    for (long d : shape) {
      n *= d;
    }
    return n;
  }

  /**
   * Returns the dense size in bytes.
   *
   * @return element count times element size
   */
  public long byteSize() {
    return elementCount() * dtype.byteSize();
  }

  /**
   * Compares name, dtype and shape.
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
    return name.equals(t.name) && dtype == t.dtype && Arrays.equals(shape, t.shape);
  }

  /**
   * Returns a hash of name, dtype and shape.
   *
   * @return the hash code
   */
  @Override
  public int hashCode() {
    return (name.hashCode() * 31 + dtype.hashCode()) * 31 + Arrays.hashCode(shape);
  }

  /**
   * Returns e.g. {@code 'input' float32 [1, 3, 224, 224]}.
   *
   * @return a readable description
   */
  @Override
  public String toString() {
    return "'" + name + "' " + dtype + " " + Arrays.toString(shape);
  }
}
