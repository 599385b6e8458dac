//! Element types and shapes of buffers.

use crate::error::{Error, Result};

/// The element types EXLA uses, with their `PJRT_Buffer_Type` codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum ElementType {
    Pred = 1,
    S8 = 2,
    S16 = 3,
    S32 = 4,
    S64 = 5,
    U8 = 6,
    U16 = 7,
    U32 = 8,
    U64 = 9,
    F16 = 10,
    F32 = 11,
    F64 = 12,
    Bf16 = 13,
    C64 = 14,
    C128 = 15,
    F8E5M2 = 16,
    F8E4M3FN = 17,
    S4 = 21,
    U4 = 22,
    S2 = 24,
    U2 = 25,
}

impl ElementType {
    pub fn from_code(code: i32) -> Result<ElementType> {
        use ElementType::*;
        const ALL: [ElementType; 21] = [
            Pred, S8, S16, S32, S64, U8, U16, U32, U64, F16, F32, F64, Bf16, C64, C128, F8E5M2,
            F8E4M3FN, S4, U4, S2, U2,
        ];
        ALL.iter()
            .copied()
            .find(|t| *t as i32 == code)
            .ok_or_else(|| Error::invalid(format!("unsupported element type code {code}")))
    }

    pub fn code(self) -> i32 {
        self as i32
    }

    /// Whether elements take less than a byte (plugins may pack them).
    pub fn sub_byte(self) -> bool {
        use ElementType::*;
        matches!(self, S4 | U4 | S2 | U2)
    }

    pub fn byte_size(self) -> usize {
        use ElementType::*;
        match self {
            Pred | S8 | U8 | F8E5M2 | F8E4M3FN => 1,
            // Host buffers of sub-byte types hold one element per byte:
            // plugins pack them on the device themselves.
            S4 | U4 | S2 | U2 => 1,
            S16 | U16 | F16 | Bf16 => 2,
            S32 | U32 | F32 => 4,
            S64 | U64 | F64 | C64 => 8,
            C128 => 16,
        }
    }
}

/// An array shape: element type and dimensions.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Shape {
    pub element_type: ElementType,
    pub dims: Vec<i64>,
}

impl Shape {
    /// Checks the dimensions and returns the shape.
    pub fn new(element_type: ElementType, dims: Vec<i64>) -> Result<Shape> {
        if let Some(d) = dims.iter().find(|d| **d < 0) {
            return Err(Error::invalid(format!("negative dimension {d} in shape")));
        }
        let shape = Shape { element_type, dims };
        shape.byte_size()?;
        Ok(shape)
    }

    /// Size in bytes of a dense array of this shape, if it fits in memory.
    pub fn byte_size(&self) -> Result<usize> {
        self.dims
            .iter()
            .try_fold(self.element_type.byte_size(), |acc, d| {
                usize::try_from(*d).ok().and_then(|d| acc.checked_mul(d))
            })
            .filter(|size| *size <= isize::MAX as usize)
            .ok_or_else(|| Error::invalid(format!("shape {:?} is too large", self.dims)))
    }
}
